"""What the demos, the benchmarks and the tests share: bit-exact comparison of training
states (``compare``) and child processes, alone or as the ranks of a local job
(``processes``). Nothing here is part of the checkpointing library itself."""
