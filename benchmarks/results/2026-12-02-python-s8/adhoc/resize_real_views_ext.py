import numpy as np, cv2, time
cv2.setNumThreads(1)
from fastfeed.packed.reader import DatasetReader
from fastfeed.packed.index import DatasetIndex
from fastfeed import _resize as R
ds="bench-data/real-2000.ff-raw-500-250"
r=DatasetReader(DatasetIndex.load(ds))
rng=np.random.default_rng(0)
views=[]
for i in rng.permutation(2000):
    s=r.read(int(i)); h,w=s["__shape__"]; views.append(np.frombuffer(s["rgb8"],np.uint8).reshape(h,w,3))
dst=np.empty((224,224,3),np.uint8)
boxes=[]
for v in views:
    h,w=v.shape[:2]
    a=rng.uniform(0.08,1)*h*w; ar=np.exp(rng.uniform(np.log(3/4),np.log(4/3)))
    cw=min(w,int(round(np.sqrt(a*ar)))); ch=min(h,int(round(np.sqrt(a/ar))))
    boxes.append((rng.integers(0,h-ch+1),rng.integers(0,w-cw+1),ch,cw))
print("mean crop KB", np.mean([b[2]*b[3]*3 for b in boxes])/1e3, "crop rows*width KB", np.mean([b[2]*v.shape[1]*3 for b,v in zip(boxes,views)])/1e3)
def run(fn):
    t=time.process_time()
    for v,(y,x,h,w) in zip(views,boxes): fn(v[y:y+h,x:x+w])
    return round((time.process_time()-t)/len(views)*1e6,1)
hot=views[0]
for rep in range(3):
    print("cv2", run(lambda c: cv2.resize(c,(224,224),dst=dst,interpolation=cv2.INTER_LINEAR)),
      "ext", run(lambda c: R.resize(c,dst,False)),
      "ext-hot", run(lambda c: R.resize(hot[:c.shape[0],:c.shape[1]],dst,False)),
      "sum(touch)", run(lambda c: c.sum()), "copy", run(lambda c: c.copy()))
