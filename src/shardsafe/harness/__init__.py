"""What the demos, the benchmarks and the tests share: bit-exact comparison of training
states (``compare``), child processes, alone or as the ranks of a local job
(``processes``), a moto S3 server on loopback (``moto_server``) and the checkpoint of a
simulated FSDP job at any scale (``synthetic_job``). Nothing here is part of the
checkpointing library itself."""
