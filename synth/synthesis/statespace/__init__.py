"""The search's state space, in parts.

:class:`StateSpace` is the semantics of :mod:`synth.synthesis.semantics` as
the search and the tracer use it: device states interned as small ids,
groups computed once per orbit, states stepped per pattern, per shifted key
or with numpy. Each part is one module, with its invariant and a worked
example in its docstring, and owns its memo tables:

* :mod:`.translations`: digitwise translations of devices and masks;
* :mod:`.positions`: device states moved along the chunks;
* :mod:`.interning`: states, masks and profiles as ids ("Positions");
* :mod:`.keys`: what the search stores per state (:class:`Packed`);
* :mod:`.bits`: collectives as bits, and the lookahead's packed counts;
* :mod:`.checks`: which collectives a group's members may run;
* :mod:`.outcomes`: the rules on one group, in the space's frames;
* :mod:`.lookahead`: which steps can still reach the goal in time;
* :mod:`.patterns`, :mod:`.shifts`, :mod:`.vectors`: the alternative ways to
  step a state;
* :mod:`.tuning`: the thresholds that choose between those ways;
* :mod:`.space`: :class:`StateSpace` and the shared :func:`state_space`.
"""

from .keys import Packed, StateKey
from .space import StateSpace, state_space
from .translations import Translations
from .tuning import DEFAULT_TUNING, SearchTuning

__all__ = ["DEFAULT_TUNING", "Packed", "SearchTuning", "StateKey", "StateSpace", "Translations", "state_space"]
