import torch, time, statistics, sys
th = int(sys.argv[1]); torch.set_num_threads(th)
from algorithms.codecs.registry import make_codec
from algorithms.codecs import decode
g = torch.Generator().manual_seed(1)
x = torch.randn(1 << 22, generator=g)
out = []
for spec in ("qstoch:bits=4", "sparse-qstoch:bits=4"):
    c = make_codec(spec)
    y = x if spec.startswith("qstoch") else torch.where(x.abs() > 1.645, x, 0.0)
    p = c.encode(y, g)
    e, d = [], []
    for _ in range(15):
        t=time.perf_counter(); c.encode(y, g); e.append(time.perf_counter()-t)
        t=time.perf_counter(); decode(p); d.append(time.perf_counter()-t)
    out.append(f"{spec} enc {1e3*statistics.median(e):.2f} dec {1e3*statistics.median(d):.2f}")
print(" | ".join(out))
