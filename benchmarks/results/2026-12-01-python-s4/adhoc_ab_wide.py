import sys, time, fastfeed
from fastfeed.decode import roi
real = roi.decode_crop
def packed(data, d, rect, scratch=None):
    return real(data, d, rect, scratch[: rect[2] * rect[3] * 3])
dl = fastfeed.loader(sys.argv[1], batch_size=256, image_size=224, num_workers=0, pin_memory=False)
def run(ep):
    dl.set_epoch(ep); n = 0
    c0 = time.process_time()
    for b in dl:
        n += len(b["__key__"])
        if n >= 2048: break
    return (time.process_time() - c0) / n * 1e3
run(0)
res = {"copy": [], "wide": []}
for ep in range(6):
    for m in res:
        roi.decode_crop = real if m == "wide" else packed
        res[m].append(run(ep + 1))
for m, v in res.items(): print(m, f"min {min(v):.3f} median {sorted(v)[3]:.3f} ms/img")
