import sys; sys.path.insert(0, __import__("os").path.dirname(__file__))
from run_common import *
s = sess(model_concat()); res = {}
for rnd in range(5):
    for base in (256, 2048):
        lengths, q_valid, caches, x = setup(base, base); T = base + S
        mask = np.zeros((B, 1, S, T), bool)
        for r in range(B):
            for s_ in range(S): mask[r, 0, s_, :lengths[r] + s_ + 1] = True
            mask[r, 0, :, lengths[r]:base] = False
        feed = {"x": x, "mask": mask}
        for i in range(L): feed[f"past_key_{i}"], feed[f"past_value_{i}"] = caches[2*i], caches[2*i+1]
        def step():
            outs = s.run(None, feed)
            return [np.ascontiguousarray(p[:, :, :base + 2]) for p in outs[1:]]
        res.setdefault((base, "run"), []).append(timeit(lambda: s.run(None, feed), 40))
        res.setdefault((base, "step"), []).append(timeit(step, 40))
for base in (256, 2048):
    print(f"v1 concat len~{base}: run {min(res[(base, 'run')]):.2f} ms; run + host slice-copy (today's commit) {min(res[(base, 'step')]):.2f} ms")
