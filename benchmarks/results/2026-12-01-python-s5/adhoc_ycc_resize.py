import sys, time, os, importlib.util, numpy as np, cv2
sys.path.insert(0, "/work/h6")
from tools.synth import make_jpeg
spec = importlib.util.spec_from_file_location("fastfeed._jpegroi", [f for f in __import__("glob").glob("/tmp/h6ycc/fastfeed/*.so")][0])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
cv2.setNumThreads(1)
from fastfeed.decode import roi
rng = np.random.default_rng(0)
imgs = [roi.add_restarts(make_jpeg(rng, (500, 375))) for _ in range(100)]
rects = []
for i in range(100):
    r = np.random.default_rng(i); h = int(r.integers(150, 375)); w = int(r.integers(150, 500))
    rects.append((int(r.integers(0, 375 - h + 1)), int(r.integers(0, 500 - w + 1)), h, w))
scratch = np.empty(5_000_000, np.uint8)
dst = np.empty((224, 224, 3), np.uint8)
M = np.array([[1, 0, 1.402], [1, -0.344136, -0.714136], [1, 1.772, 0]], np.float32)
def run(ycc, n=5):
    best = 1e9
    for _ in range(n):
        t = time.process_time()
        for d, (y, x, h, w) in zip(imgs, rects):
            m.decode_crop(d, scratch, 1, y, x, h, w)
            crop = scratch[: h * w * 3].reshape(h, w, 3)
            cv2.resize(crop, (224, 224), dst=dst, interpolation=cv2.INTER_LINEAR)
            if ycc:
                out = cv2.cvtColor(dst[:, :, [0, 2, 1]] if ycc == 2 else dst, cv2.COLOR_YCrCb2RGB)
        best = min(best, time.process_time() - t)
    return best / len(imgs) * 1e3
print("RGB decode + resize   %.3f ms" % run(0))
os.environ["YCC"] = "1"
print("YCC decode + resize + cvtColor(no swap) %.3f ms" % run(1))
print("YCC decode + resize + swap + cvtColor %.3f ms" % run(2))
