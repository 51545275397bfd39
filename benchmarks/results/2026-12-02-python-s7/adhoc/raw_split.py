import time, sys, numpy as np
import fastfeed
from fastfeed.loading.cpu import dataset as D
from fastfeed.decode import cpu as C, raw as R
acc={"read":0.0,"decode":0.0,"resize":0.0,"n":0}
orig_dec=C.CpuDecoder.decode_batch
def dec(self,*a,**k):
    t=time.process_time(); r=orig_dec(self,*a,**k); acc["decode"]+=time.process_time()-t; return r
C.CpuDecoder.decode_batch=dec
orig_mb=D.__dict__
import fastfeed.decode.resize as RS
orig_rs=R.resize_into
def rs(*a,**k):
    t=time.perf_counter(); orig_rs(*a,**k); acc["resize"]+=time.perf_counter()-t
R.resize_into=rs
dl = fastfeed.loader(sys.argv[1], batch_size=128, image_size=224, num_workers=0, shuffle=True)
for e in range(4):
    dl.set_epoch(e)
    for b in dl: pass
for k in acc: acc[k]=0
t0=time.process_time()
for e in range(4,8):
    dl.set_epoch(e)
    for b in dl: acc["n"]+=len(b["__key__"])
tot=time.process_time()-t0; n=acc["n"]
print(f"total {tot/n*1e6:.1f} us/img; decode_batch {acc['decode']/n*1e6:.1f} (resize_into {acc['resize']/n*1e6:.1f}); outside decode {(tot-acc['decode'])/n*1e6:.1f}")
