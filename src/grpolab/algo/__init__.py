"""Layer 2, pure maths: the algorithm presets (AlgoConfig), advantage estimators, policy objectives, KL
estimators, reward shaping and PPO's GAE. Functions over tensors, each with its equation; no model,
training or application code is imported here.
"""
