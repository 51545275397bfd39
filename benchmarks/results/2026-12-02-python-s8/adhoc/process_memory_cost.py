import time, fastfeed, os
from fastfeed.host import process_memory
dl = fastfeed.loader("bench-data/real-2000.ff-raw-500-250", batch_size=128, image_size=224, num_workers=2, prefetch_factor=2, shuffle=True, seed=0, pin_memory=False)
for e in range(6):
    dl.set_epoch(e)
    for b in dl: pass
ts=[]; cpu=[]
for i in range(10):
    t=time.perf_counter(); c=time.process_time(); s=process_memory(); ts.append(time.perf_counter()-t); cpu.append(time.process_time()-c)
print("process_memory wall ms", [round(x*1e3,1) for x in ts], "cpu ms", [round(x*1e3,1) for x in cpu], s)
