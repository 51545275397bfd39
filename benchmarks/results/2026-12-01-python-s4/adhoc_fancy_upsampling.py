# Build first: sed 's/cinfo.do_fancy_upsampling = TRUE;/cinfo.do_fancy_upsampling = getenv("NOFANCY") ? FALSE : TRUE;/' fastfeed/_jpegroi.c
# (plus #include <stdlib.h>) compiled with gcc -O2 -shared -fPIC -ljpeg to /tmp/s4/var/D/_jpegroi.so; crops from adhoc_crop_jobs.py.
import sys, os, time, importlib.util, numpy as np, cv2
spec = importlib.util.spec_from_file_location("_jpegroi", "/tmp/s4/var/D/_jpegroi.so")
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
cv2.setNumThreads(1)
jobs = np.load("/tmp/s4/jobs.npy", allow_pickle=True)
datas = [bytes(j[0]) for j in jobs]
out = np.empty(600*700*3, np.uint8)
def run():
    for data, (d, t, l, h, w) in zip(datas, (j[1] for j in jobs)):
        mod.decode_crop(data, out, d, t, l, h, w, True)
res = {0: [], 1: []}
run()
for rep in range(8):
    for nf in (0, 1):
        if nf: os.environ["NOFANCY"] = "1"
        else: os.environ.pop("NOFANCY", None)
        c = time.process_time(); run(); res[nf].append((time.process_time() - c) / len(datas) * 1e3)
for k, v in res.items(): print("nofancy" if k else "fancy", f"min {min(v):.3f} median {sorted(v)[4]:.3f}")
