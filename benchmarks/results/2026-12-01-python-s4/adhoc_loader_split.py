import os, sys, time, psutil, fastfeed
path = sys.argv[1]; nw = int(sys.argv[2]) if len(sys.argv) > 2 else 2
dl = fastfeed.loader(path, batch_size=256, image_size=224, num_workers=nw, prefetch_factor=2,
                     shuffle=True, seed=0, pin_memory=False, reuse_buffers=sys.argv[4] == "1")
me = psutil.Process()
def cpu(p):
    t = p.cpu_times(); return t.user + t.system
for ep in range(int(sys.argv[3]) if len(sys.argv) > 3 else 2):
    dl.set_epoch(ep)
    it = iter(dl)
    n = 0
    for i, b in enumerate(it):
        if i == 3:
            kids = me.children()
            c0 = {k.pid: cpu(k) for k in kids}; m0 = cpu(me); t0 = time.perf_counter(); n = 0
        n += len(b["__key__"])
    t = time.perf_counter() - t0
    kids_c = sum(cpu(k) - c0.get(k.pid, 0) for k in me.children())
    m = cpu(me) - m0
    print(f"reuse={sys.argv[4]} epoch {ep}: {n/t:.0f} img/s wall, main {m:.2f}s cpu ({m/t*100:.0f}%), workers {kids_c:.2f}s, img/cpu-s {n/(m+kids_c):.0f}, worker ms/img {kids_c/n*1000:.3f}, main ms/img {m/n*1000:.3f}")
