"""Ad-hoc (indicative): CPU per image of the raw-pixel loader in one process, under cProfile.

    PYTHONPATH=. .venv/bin/python benchmarks/results/2026-12-02-raw/adhoc_profile_raw.py bench-data/real-2000.ff-raw-500-250
"""
import cProfile, pstats, time, sys
import fastfeed
ds = sys.argv[1]
dl = fastfeed.loader(ds, batch_size=128, image_size=224, num_workers=0, shuffle=True)
it = iter(dl)
for _ in range(3): next(it)
n=0; t0=time.process_time()
pr = cProfile.Profile(); pr.enable()
for epoch in range(2):
    dl.set_epoch(epoch+1)
    for b in dl:
        n += len(b["__key__"])
pr.disable()
dt=time.process_time()-t0
print(f"{n} images, {dt/n*1e6:.1f} us CPU per image (profiled)")
pstats.Stats(pr).sort_stats("tottime").print_stats(14)
