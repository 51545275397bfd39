import sys, time, gc, fastfeed
dl = fastfeed.loader(sys.argv[1], batch_size=256, image_size=224, num_workers=0, pin_memory=False)
def run(ep):
    dl.set_epoch(ep); n = 0
    c0 = time.process_time()
    for b in dl:
        n += len(b["__key__"])
        if n >= 2048: break
    return (time.process_time() - c0) / n * 1e3
run(0)
res = {"on": [], "off": [], "frozen": []}
for ep in range(6):
    for m in res:
        gc.unfreeze(); gc.enable()
        if m == "off": gc.disable()
        if m == "frozen": gc.freeze()
        res[m].append(run(ep + 1))
for m, v in res.items(): print(m, f"min {min(v):.3f} median {sorted(v)[3]:.3f}")
