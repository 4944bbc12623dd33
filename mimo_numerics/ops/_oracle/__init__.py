"""What the FP64 oracles share among themselves (never with the policy references, which import nothing from here).

* :mod:`.pair_weights`: the token-pair decay weights ``W[t, s]`` of one target chunk at a time, so that every oracle
  sums over token pairs in memory linear in S (one ``[B, H, C, S]`` block, never ``[B, H, S, S]``).
"""
