import numpy as np, fastfeed
from fastfeed.decode import image as im
dl = fastfeed.loader('bench-data/synth-10000.ff-tar-1250-rst', batch_size=256, image_size=224, num_workers=0, pin_memory=False)
jobs = []
orig = im.roi.decode_crop
def spy(data, denom, rect, scratch=None):
    jobs.append((bytes(data), (denom, *rect)))
    return orig(data, denom, rect, scratch)
im.roi.decode_crop = spy
n = 0
for b in dl:
    n += len(b['__key__'])
    if n >= 1024: break
arr = np.empty(len(jobs), object); arr[:] = jobs
np.save('/tmp/s4/jobs.npy', arr, allow_pickle=True)
from collections import Counter
print(len(jobs), Counter(j[1][0] for j in jobs))
