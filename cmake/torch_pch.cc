// The host of the build's one precompiled <torch/torch.h> (trainctl_torch_pch in the top-level
// CMakeLists.txt): every torch target reuses the header this target precompiles.
