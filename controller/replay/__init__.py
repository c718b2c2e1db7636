"""``pdctl replay``'s library: request traces read and checked (``trace``), the prompts made
for them (``prompts``), the send schedule (``schedule``) and the summaries of a run
(``summary``). Pure: no network, no clock; the command in ``controller/cli/replay.py`` sends."""
