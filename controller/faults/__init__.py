"""Fault rehearsals (``pdctl fault``): one fault injected into a running fleet under a load of
known prompts, and what that load's clients saw judged -- every request completed or got a
clear error, none hung, no answer that differs from its reference, every request in the
controller's records, nothing held on an engine afterwards, and the fault recorded where the
console shows it.

``inject`` acts on the fleet (signals to an engine's processes, a pool change); ``outcome``
judges, as data that tests assert; ``cli.fault`` drives both.
"""
