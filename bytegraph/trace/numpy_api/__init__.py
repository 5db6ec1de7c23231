"""NumPy in the trace: NumPy functions, ufuncs and ndarray operations as graph nodes with NumPy's
semantics, and tensors and arrays seen as each other."""
