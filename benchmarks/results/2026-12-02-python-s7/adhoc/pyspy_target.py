import sys, time, fastfeed
dl = fastfeed.loader(sys.argv[1], batch_size=128, image_size=224, num_workers=2, prefetch_factor=2, pin_memory=False, seed=0)
t0=time.time(); e=0
while time.time()-t0 < float(sys.argv[2]):
    dl.set_epoch(e); e+=1
    for b in dl: pass
