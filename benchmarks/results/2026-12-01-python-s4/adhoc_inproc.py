import sys, time, fastfeed
path = sys.argv[1]; passes = int(sys.argv[2]) if len(sys.argv) > 2 else 2
dl = fastfeed.loader(path, batch_size=256, image_size=224, num_workers=0, pin_memory=False)
for ep in range(passes):
    dl.set_epoch(ep)
    c0 = time.process_time(); n = 0
    for b in dl:
        n += len(b["__key__"])
        if n >= 5120: break
    c = time.process_time() - c0
    print(f"pass {ep}: {n/c:.0f} img/cpu-s, {c/n*1000:.3f} ms/img")
