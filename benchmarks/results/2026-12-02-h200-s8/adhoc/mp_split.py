"""CPU per image of fastfeed.loader's processes, split main / workers and user / sys (indicative).

Usage: FASTFEED_RAW_READS=map|rows PYTHONPATH=. python3 mp_split.py DATASET WORKERS EPOCHS
(2 warm-up epochs, then EPOCHS measured; batch 128, 224x224, prefetch 2, no pin_memory).
"""
import sys
import time

import psutil

import fastfeed

path, workers, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dl = fastfeed.loader(path, batch_size=128, image_size=224, num_workers=workers, prefetch_factor=2, shuffle=True,
                     seed=0, pin_memory=False)
me = psutil.Process()


def minflt(pid):
    """Minor page faults of a process so far (/proc/PID/stat, field 10)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def cpu():
    kids = me.children(recursive=True)
    m = me.cpu_times()
    kt = [k.cpu_times() for k in kids]
    return (m.user, m.system, sum(t.user for t in kt), sum(t.system for t in kt), sum(minflt(k.pid) for k in kids))


for e in range(2):
    dl.set_epoch(e)
    for b in dl:
        pass
c0, n, t = cpu(), 0, time.perf_counter()
for e in range(2, 2 + epochs):
    dl.set_epoch(e)
    for b in dl:
        n += len(b["__key__"])
c1, wall = cpu(), time.perf_counter() - t
mu, ms, wu, ws = [(a - b) / n * 1e6 for a, b in zip(c1[:4], c0[:4])]
faults = (c1[4] - c0[4]) / n
print(f"{path.rstrip('/').split('/')[-1]} {workers} workers, {n} images: {n / wall:,.0f} img/s; us CPU per image: "
      f"main {mu + ms:.1f} (user {mu:.1f}, sys {ms:.1f}); workers {wu + ws:.1f} (user {wu:.1f}, sys {ws:.1f}); "
      f"total {mu + ms + wu + ws:.1f} -> {1e6 / (mu + ms + wu + ws):,.0f} img/CPU-s; workers' minor faults per "
      f"image {faults:.1f}", flush=True)
