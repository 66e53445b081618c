import sys; sys.path.insert(0, __import__("os").path.dirname(__file__))
from run_common import *
s = sess(model_gqa()); C = 512
lengths, _, caches, x = setup(C, 300); q_valid = np.array([4, 0, 1, 4])
ref_y, ref_c = reference(x, caches, lengths, q_valid); before = [c.copy() for c in caches]
io, vals, y = bind_common(s, caches, {"x": x, **feeds_for("gqa", lengths, q_valid, C)}); s.run_with_iobinding(io)
print("idle row (Q=0) cache unchanged:", all(np.array_equal(caches[j][1], before[j][1]) for j in range(4)),
      "; other rows max err:", max(np.abs(y[r, :q_valid[r]] - ref_y[r, :q_valid[r]]).max() for r in (0, 2, 3)))
# rollback = a length: step 1 writes 4 rows/row, keep [1,4,2,3]; step 2 starts at lengths+keep and overwrites the rejected rows
lengths, q_valid, caches, x = setup(C, 300); q_valid = np.array([4, 4, 4, 4])
io, vals, y = bind_common(s, caches, {"x": x, **feeds_for("gqa", lengths, q_valid, C)}); s.run_with_iobinding(io)
keep = np.array([1, 4, 2, 3]); l2 = lengths + keep; x2 = np.random.default_rng(5).standard_normal(x.shape).astype(np.float32)
ref_y2, _ = reference(x2, caches, l2, q_valid)
io, vals, y = bind_common(s, caches, {"x": x2, **feeds_for("gqa", l2, q_valid, C)}); s.run_with_iobinding(io)
print("rollback by length, step 2 max err vs reference:", np.abs(y - ref_y2).max())
