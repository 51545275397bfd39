import time, sys, os, numpy as np
import fastfeed
from fastfeed.packed import reader as R
from fastfeed.formats import tar_reader as T
orig = T.FastTarReader.wants_hints
dl = fastfeed.loader(sys.argv[1], batch_size=128, image_size=224, num_workers=0, seed=0)
def run(epochs, e0):
    n=0; t=time.process_time()
    for e in range(e0, e0+epochs):
        dl.set_epoch(e)
        for b in dl: n+=len(b["__key__"])
    return (time.process_time()-t)/n*1e6
run(2,0)
res={"hints":[], "skip":[]}
e=2
for rep in range(6):
    for k in ("hints","skip"):
        T.FastTarReader.wants_hints = (lambda self: True) if k=="hints" else orig
        res[k].append(run(3,e)); e+=3
for k,v in res.items(): print(k, "median %.1f us/img" % np.median(v), [round(x,1) for x in v])
