import sys; sys.path.insert(0,'tests/decode')
import numpy as np, cv2
from test_resize_kernel import reference, _ext, images
rng=np.random.default_rng(0)
for shape,out in [((375,500),(224,224)),((447,447),(224,224)),((100,90),(224,224))]:
    for name,img in images(rng,*shape).items():
        ref=reference(img,*out)
        a=np.abs(_ext(img,*out)-ref); b=np.abs(cv2.resize(img,out[::-1],interpolation=cv2.INTER_LINEAR)-ref)
        print(shape,name,"ext max %.2f mean %.3f | cv2 max %.2f mean %.3f"%(a.max(),a.mean(),b.max(),b.mean()))
