import numpy as np, cv2, time, torch
import torch.nn.functional as F
cv2.setNumThreads(1); torch.set_num_threads(1)
rng=np.random.default_rng(0)
img=rng.integers(0,255,(375,500,3),dtype=np.uint8)
dst=np.empty((224,224,3),np.uint8)
boxes=[]
for i in range(2000):
    a=rng.uniform(0.08,1)*375*500; r=np.exp(rng.uniform(np.log(3/4),np.log(4/3)))
    w=int(round(np.sqrt(a*r))); h=int(round(np.sqrt(a/r)))
    if w<=500 and h<=375: boxes.append((rng.integers(0,376-h),rng.integers(0,501-w),h,w))
def timeit(f):
    for b in boxes[:50]: f(b)
    t=time.process_time()
    for b in boxes: f(b)
    return round((time.process_time()-t)/len(boxes)*1e6,1)
for rep in range(2):
  print("cv2 linear view", timeit(lambda b: cv2.resize(img[b[0]:b[0]+b[2],b[1]:b[1]+b[3]],(224,224),dst=dst,interpolation=cv2.INTER_LINEAR)))
  timg=torch.from_numpy(img)
  tdst=torch.from_numpy(dst)
  def tor(b, aa):
    y,x,h,w=b
    t=timg[y:y+h,x:x+w].permute(2,0,1).unsqueeze(0).contiguous(memory_format=torch.channels_last)
    o=F.interpolate(t,size=(224,224),mode="bilinear",antialias=aa,align_corners=False)
    tdst.copy_(o[0].permute(1,2,0))
  print("torch CL bilinear", timeit(lambda b: tor(b,False)))
  print("torch CL bilinear aa", timeit(lambda b: tor(b,True)))
print(torch.__config__.show()[:800])
