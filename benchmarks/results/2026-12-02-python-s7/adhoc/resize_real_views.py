import numpy as np, cv2, time, json, mmap, glob
cv2.setNumThreads(1)
import fastfeed
from fastfeed.packed.reader import DatasetReader
ds="bench-data/real-2000.ff-raw-500-250"
from fastfeed.packed.index import DatasetIndex
r=DatasetReader(DatasetIndex.load(ds))
n=len(r.index.shapes) if hasattr(r.index,'shapes') else None
rng=np.random.default_rng(0)
order=rng.permutation(n)
views=[]
for i in order:
    s=r.read(int(i))
    h,w=s["__shape__"]; views.append(np.frombuffer(s["rgb8"],np.uint8).reshape(h,w,3))
dst=np.empty((224,224,3),np.uint8)
from fastfeed.decode.geometry import random_resized_crop
boxes=[]
for v in views:
    h,w=v.shape[:2]
    a=rng.uniform(0.08,1)*h*w; ar=np.exp(rng.uniform(np.log(3/4),np.log(4/3)))
    cw=min(w,int(round(np.sqrt(a*ar)))); ch=min(h,int(round(np.sqrt(a/ar))))
    boxes.append((rng.integers(0,h-ch+1),rng.integers(0,w-cw+1),ch,cw))
from fastfeed.decode.resize import resize_into
def run(fn):
    t=time.process_time()
    for v,(y,x,h,w) in zip(views,boxes): fn(v[y:y+h,x:x+w])
    return round((time.process_time()-t)/len(views)*1e6,1)
for rep in range(3):
    print("linear", run(lambda c: cv2.resize(c,(224,224),dst=dst,interpolation=cv2.INTER_LINEAR)),
      "nearest", run(lambda c: cv2.resize(c,(224,224),dst=dst,interpolation=cv2.INTER_NEAREST)),
      "resize_into", run(lambda c: resize_into(cv2,c,dst,False)),
      "sum(touch)", run(lambda c: c.sum()))
hot=views[0]
print("hot linear", run(lambda c: cv2.resize(hot[:c.shape[0],:c.shape[1]],(224,224),dst=dst,interpolation=cv2.INTER_LINEAR)))
tot=sum(v.nbytes for v in views)
big=np.empty(tot,np.uint8); off=0; anon=[]
for v in views:
    big[off:off+v.nbytes]=v.reshape(-1); anon.append(big[off:off+v.nbytes].reshape(v.shape)); off+=v.nbytes
def run2(fn, vs):
    t=time.process_time()
    for v,(y,x,h,w) in zip(vs,boxes): fn(v[y:y+h,x:x+w])
    return round((time.process_time()-t)/len(vs)*1e6,1)
for rep in range(2):
    print("anon-THP linear", run2(lambda c: cv2.resize(c,(224,224),dst=dst,interpolation=cv2.INTER_LINEAR),anon),
          "mmap linear", run2(lambda c: cv2.resize(c,(224,224),dst=dst,interpolation=cv2.INTER_LINEAR),views))
print(open("/proc/meminfo").read().split("AnonHugePages")[1][:30])
