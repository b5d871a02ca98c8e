"""Official scorers, one module per benchmark, each reproducing the benchmark's own definition
(the source file is named in each module). Tested against hand-made cases with known answers.
Everything is re-exported here: task files use `from tasks import metrics; metrics.qa_f1_score(...)`.
"""
from tasks.metrics.infinitebench import *  # noqa: F401,F403
from tasks.metrics.longbench import *  # noqa: F401,F403
from tasks.metrics.math_answers import *  # noqa: F401,F403
from tasks.metrics.passkey import *  # noqa: F401,F403
from tasks.metrics.ruler import *  # noqa: F401,F403
from tasks.metrics.summarization import *  # noqa: F401,F403
