"""The computations behind the attention layers' paths, and the one policy that picks a path for a call.

`vitkit.kernels.attention`: dense scaled dot-product attention (reference, explicit, blocked, torch's fused kernel);
`vitkit.kernels.deformable`: multi-scale deformable sampling (reference, gather, levelwise with its backward);
`vitkit.kernels.policy`: which path a call takes on the device and dtype at hand. Each kernel states its own cost rows
(`vitkit.cost.costed`): what the dispatcher cannot see is the path the costed device would take.
"""
