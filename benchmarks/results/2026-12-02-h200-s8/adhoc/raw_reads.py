"""How raw pixels reach the resize, per image of CPU (user + sys), P processes each reading 1/P of
every epoch in shuffled order (as P loader workers do), no DataLoader around it:

- map:          a view of the shard's memory map (page faults on first touch in each process);
- map+populate: the same, after madvise(MADV_POPULATE_READ) of the crop's rows (one syscall
                maps them all; Linux >= 5.14, EINVAL where unsupported: then counted as failed);
- rows:         one preadv of the crop's rows into a reused buffer (FASTFEED_RAW_READS=rows).

Usage: PYTHONPATH=. python3 raw_reads.py RAW_DATASET PROCS EPOCHS
(indicative; written for session 8's question of why `map` costs 1.6x `rows` on the gVisor host).
"""

import ctypes
import os
import sys
import time

import numpy as np

MADV_POPULATE_READ = 22
PAGE = os.sysconf("SC_PAGE_SIZE")


def run(mode: str, ds: str, procs: int, epochs: int) -> tuple[float, int]:
    os.environ["FASTFEED_RAW_READS"] = "rows" if mode == "rows" else "map"
    from fastfeed import _resize
    from fastfeed.decode.geometry import NUM_UNIFORMS, random_resized_crop
    from fastfeed.decode.raw import SpanPixels, pixels
    from fastfeed.formats.tar_reader import _address
    from fastfeed.packed.index import DatasetIndex
    from fastfeed.packed.reader import DatasetReader

    libc = ctypes.CDLL(None, use_errno=True)
    n = DatasetIndex.load(ds).num_samples
    t0 = os.times()
    pids = []
    for w in range(procs):
        pid = os.fork()
        if pid == 0:
            reader = DatasetReader(DatasetIndex.load(ds))
            dst = np.empty((224, 224, 3), np.uint8)
            rng = np.random.default_rng(w)
            fails = 0
            for e in range(epochs):
                order = np.random.default_rng(e).permutation(n)[w::procs]
                for i in order:
                    s = reader.read(int(i))
                    arr = pixels(s["rgb8"], s["__shape__"])
                    h, wd = arr.shape[:2]
                    top, left, ch, cw = random_resized_crop(h, wd, rng.random(NUM_UNIFORMS))
                    ch, cw = min(ch, 447), min(cw, 447)
                    if type(arr) is SpanPixels:
                        rows = arr.rows(top, ch)
                        crop = rows[:, left:left + cw]
                    else:
                        if mode == "map+populate":
                            a = _address(s["rgb8"]) + top * wd * 3
                            start = a - a % PAGE
                            ln = a + ch * wd * 3 - start
                            if libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(ln), MADV_POPULATE_READ):
                                fails += 1
                        crop = arr[top:top + ch, left:left + cw]
                    _resize.resize(crop, dst, True)
            if fails:
                print(f"  {mode}: madvise failed {fails} times (errno {ctypes.get_errno()})", flush=True)
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    t1 = os.times()
    cpu = (t1.children_user - t0.children_user) + (t1.children_system - t0.children_system)
    sys_ = t1.children_system - t0.children_system
    return cpu, sys_, n * epochs


if __name__ == "__main__":
    ds, procs, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    for rep in range(2):
        for mode in ("map", "map+populate", "rows"):
            t = time.perf_counter()
            cpu, sys_, imgs = run(mode, ds, procs, epochs)
            wall = time.perf_counter() - t
            print(f"{mode:13s} {cpu / imgs * 1e6:7.1f} us CPU/img (sys {sys_ / imgs * 1e6:6.1f}), "
                  f"{imgs / wall:9,.0f} img/s wall, {procs} procs x {epochs} epochs", flush=True)
