import sys, time, numpy as np, cv2
from fastfeed import _jpegroi as mod
cv2.setNumThreads(1)
jobs = np.load("/tmp/s4/jobs.npy", allow_pickle=True)
datas = [bytes(j[0]) for j in jobs]
out = np.empty(600*700*3, np.uint8); dst = np.empty((224,224,3), np.uint8)
def run(wide, resize):
    for data, (d, t, l, h, w) in zip(datas, (j[1] for j in jobs)):
        if wide:
            _, cols, skip = mod.decode_crop(data, out, d, t, l, h, w, True)
            crop = out[:h*cols*3].reshape(h, cols, 3)[:, skip:skip+w]
        else:
            mod.decode_crop(data, out, d, t, l, h, w)
            crop = out[:h*w*3].reshape(h, w, 3)
        if resize:
            cv2.resize(crop, (224, 224), dst=dst, interpolation=cv2.INTER_LINEAR)
res = {}
for resize in (0, 1):
    run(0, resize); run(1, resize)
    for rep in range(6):
        for wide in (0, 1):
            c = time.process_time(); run(wide, resize); res.setdefault((wide, resize), []).append((time.process_time() - c) / len(datas) * 1e3)
for k, v in res.items():
    print(f"wide={k[0]} resize={k[1]}: min {min(v):.3f} median {sorted(v)[3]:.3f} ms/img")
# correctness: same pixels
for data, (d, t, l, h, w) in list(zip(datas, (j[1] for j in jobs)))[:200]:
    a = np.empty(h*w*3, np.uint8); mod.decode_crop(data, a, d, t, l, h, w)
    _, cols, skip = mod.decode_crop(data, out, d, t, l, h, w, True)
    assert (out[:h*cols*3].reshape(h, cols, 3)[:, skip:skip+w] == a.reshape(h, w, 3)).all()
print("same pixels")
