"""psrv.nn: the networks being trained: flat parameter buffer, layers, updaters, data, evaluation, save/load."""
