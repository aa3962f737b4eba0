"""Diagnose reduce_scatter on symmetric windows for 16-bit dtypes."""
import numpy as np
import symnccl
from symnccl import _check
from symnccl.bootstrap import spawn


def work(rank, n, uid):
    comm = symnccl.Communicator(uid, rank, n, device=rank)
    out = []
    for dtype in ("bfloat16", "float32"):
        npdt = _check.numpy_dtype(dtype)
        for count in (1031, 4096, 4099, 4100, 8192, 65537, 196611):
            ins = [_check.make_input(dtype, count * n, r, 5) for r in range(n)]
            for win in (True, False):
                x = comm.empty(count * n, dtype)
                y = comm.empty(count, dtype) if win else None
                x.copy_from_host(ins[rank].view(np.uint8))
                if win:
                    y.copy_from_host(_check.poison(y.nbytes))
                    comm.reduce_scatter(x, out=y)
                    got = np.frombuffer(y.to_bytes(), npdt)
                else:
                    import torch
                    xt = torch.from_dlpack(x).clone()
                    yt = comm.reduce_scatter(xt)
                    torch.cuda.synchronize()
                    got = np.frombuffer(yt.cpu().view(torch.uint8).numpy().tobytes(), npdt)
                part = [a[rank * count:(rank + 1) * count] for a in ins]
                ref = _check.reference("sum", part, dtype)
                bad = np.nonzero(np.abs(got.astype(np.float64) - ref) > 0.05 * (1 + np.abs(ref)))[0]
                nan = int(np.count_nonzero(~np.isfinite(got.astype(np.float64))))
                out.append(f"r{rank} {dtype} count={count} win={win} bad={len(bad)} nan={nan} first={bad[:6].tolist()} "
                           f"got={got[bad[:3]].astype(np.float64).tolist()} ref={ref[bad[:3]].tolist()} mine={[float(part[rank][i]) for i in bad[:3]]}")
    comm.close()
    return out


if __name__ == "__main__":
    for r in spawn(work, 2):
        print("\n".join(r))
