import time, math, torch, numpy as np
shape = (256, 224, 224, 3); n = math.prod(shape)
src = np.random.default_rng(0).integers(0, 255, (224, 224, 3), dtype=np.uint8)
def fresh_shared():
    st = torch.empty(0, dtype=torch.uint8)._typed_storage()._new_shared(n)
    return torch.empty(0, dtype=torch.uint8).new(st)[:n].view(shape)
def fill(t):
    a = t.numpy()
    for j in range(shape[0]): a[j] = src
reuse = fresh_shared()
for name, f in [("fresh shm", lambda: fill(fresh_shared())), ("fresh plain", lambda: fill(torch.empty(shape, dtype=torch.uint8))), ("reused", lambda: fill(reuse))] * 2:
    c = time.process_time(); w = time.perf_counter()
    for _ in range(10): f()
    print(f"{name:12s} cpu {(time.process_time()-c)/10*1e3:6.1f} ms/batch  wall {(time.perf_counter()-w)/10*1e3:6.1f}  -> {(time.process_time()-c)/10/256*1e6:5.0f} us/img")
