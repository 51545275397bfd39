import numpy as np, cv2, time, ctypes
cv2.setNumThreads(1)
import os; lib=ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "rs.so"))
f=lib.resize_bilinear_u8c3
f.argtypes=[ctypes.c_void_p,ctypes.c_long,ctypes.c_int,ctypes.c_int,ctypes.c_void_p,ctypes.c_int,ctypes.c_int,ctypes.c_int]
rng=np.random.default_rng(0)
img=rng.integers(0,255,(375,500,3),dtype=np.uint8)
import cv2; img=cv2.GaussianBlur(img,(7,7),2)
dst=np.empty((224,224,3),np.uint8); d2=dst.copy()
boxes=[]
for i in range(2000):
    a=rng.uniform(0.08,1)*375*500; r=np.exp(rng.uniform(np.log(3/4),np.log(4/3)))
    w=int(round(np.sqrt(a*r))); h=int(round(np.sqrt(a/r)))
    if 224<=w<=448 and 224<=h<=375: boxes.append((rng.integers(0,376-h),rng.integers(0,501-w),h,w))
def mine(b):
    y,x,h,w=b; c=img[y:y+h,x:x+w]
    f(c.ctypes.data,c.strides[0],h,w,dst.ctypes.data,224,224,0)
def ocv(b):
    y,x,h,w=b; cv2.resize(img[y:y+h,x:x+w],(224,224),dst=d2,interpolation=cv2.INTER_LINEAR)
def timeit(fn):
    for b in boxes[:50]: fn(b)
    t=time.perf_counter()
    for b in boxes: fn(b)
    return round((time.perf_counter()-t)/len(boxes)*1e6,1)
for r in range(3): print(len(boxes),"C", timeit(mine), "cv2", timeit(ocv))
mx=0
for b in boxes[:200]:
    mine(b); ocv(b); mx=max(mx,np.abs(dst.astype(int)-d2).max())
print("max diff", mx)
