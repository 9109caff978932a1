"""The simulated clock: device profiles (:mod:`fedsim.sim.profiles`), the time model of a round
(:mod:`fedsim.sim.clock`) and clocked rounds (:mod:`fedsim.sim.rounds`)."""
