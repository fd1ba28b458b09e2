import torch, time
from algorithms.codecs import make_codec, decode
c = make_codec("fp32"); x = torch.randn(2*64*32)
p = c.encode(x)
for _ in range(3):
    t = time.perf_counter()
    for _ in range(2000): q = c.encode(x)
    t1 = time.perf_counter()
    for _ in range(2000): decode(p)
    t2 = time.perf_counter()
    print(f"encode {1e6*(t1-t)/2000:.1f} us  decode {1e6*(t2-t1)/2000:.1f} us")
