"""Benchmarks (speed lives here, never in tests). Results go to bench/results/.

On a shared, oversubscribed CPU, libgomp's default spin-wait makes every parallel op wait for
a descheduled peer thread (a 4 MB copy: 8-15 ms instead of 0.1 ms), which punishes many-op code
far more than one big kernel. PASSIVE threads sleep at barriers instead. It must be set before
torch loads libgomp, so it lives in the package init; an explicit OMP_WAIT_POLICY wins.
"""

from aah_core.process import set_up

set_up()  # and freed memory kept for reuse, as the engine's programs do (aah_core/process.py)
