import numpy as np, cv2, time, torch
import torch.nn.functional as F
cv2.setNumThreads(1); torch.set_num_threads(1)
rng=np.random.default_rng(0)
img=rng.integers(0,255,(375,500,3),dtype=np.uint8)
img4=rng.integers(0,255,(375,500,4),dtype=np.uint8)
dst=np.empty((224,224,3),np.uint8); dst4=np.empty((224,224,4),np.uint8)
boxes=[]
for i in range(2000):
    a=rng.uniform(0.08,1)*375*500; r=np.exp(rng.uniform(np.log(3/4),np.log(4/3)))
    w=int(round(np.sqrt(a*r))); h=int(round(np.sqrt(a/r)))
    if w<=500 and h<=375: boxes.append((rng.integers(0,376-h),rng.integers(0,501-w),h,w))
def timeit(f):
    t=time.process_time()
    for b in boxes: f(b)
    return round((time.process_time()-t)/len(boxes)*1e6,1)
print("linear view", timeit(lambda b: cv2.resize(img[b[0]:b[0]+b[2],b[1]:b[1]+b[3]],(224,224),dst=dst,interpolation=cv2.INTER_LINEAR)))
print("linear 4ch", timeit(lambda b: cv2.resize(img4[b[0]:b[0]+b[2],b[1]:b[1]+b[3]],(224,224),dst=dst4,interpolation=cv2.INTER_LINEAR)))
print("linear contig copy", timeit(lambda b: cv2.resize(np.ascontiguousarray(img[b[0]:b[0]+b[2],b[1]:b[1]+b[3]]),(224,224),dst=dst,interpolation=cv2.INTER_LINEAR)))
timg=torch.from_numpy(img)
def tor(b, aa):
    y,x,h,w=b
    t=timg[y:y+h,x:x+w].permute(2,0,1).unsqueeze(0)
    o=F.interpolate(t,size=(224,224),mode="bilinear",antialias=aa,align_corners=False)
    dst[...]=o[0].permute(1,2,0).numpy()
print("torch bilinear", timeit(lambda b: tor(b,False)))
print("torch bilinear aa", timeit(lambda b: tor(b,True)))
M=None
def warp(b):
    y,x,h,w=b
    M=np.array([[w/224,0,x+0.5*w/224-0.5],[0,h/224,y+0.5*h/224-0.5]],np.float64)
    cv2.warpAffine(img,M,(224,224),dst=dst,flags=cv2.INTER_LINEAR|cv2.WARP_INVERSE_MAP)
print("warpAffine", timeit(warp))
from PIL import Image
pim=Image.fromarray(img)
def pil(b):
    y,x,h,w=b
    o=pim.resize((224,224),Image.BILINEAR,box=(x,y,x+w,y+h))
    dst[...]=np.asarray(o)
print("PIL bilinear box", timeit(pil))
def sep(b):
    y,x,h,w=b
    t=cv2.resize(img[y:y+h,x:x+w],(w,224),interpolation=cv2.INTER_LINEAR)
    cv2.resize(t,(224,224),dst=dst,interpolation=cv2.INTER_LINEAR)
print("separable 2 pass", timeit(sep))
