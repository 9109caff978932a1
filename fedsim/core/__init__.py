"""The foundation every other package stands on, importing nothing else from fedsim: the task and update
records exchanged with workers (:mod:`~fedsim.core.types`), errors (:mod:`~fedsim.core.errors`), the flat
parameter vector (:mod:`~fedsim.core.params`), every random stream's seed (:mod:`~fedsim.core.seeding`),
verified checkpoint files and atomic writes (:mod:`~fedsim.core.checkpoint`, :mod:`~fedsim.core.storage`),
client-state values, torch's thread count and the optional extras."""
