"""The Streamlit glue shared by the pages, one job a module: ``session`` (who this browser
session is and which controller it talks to), ``reads`` (the controller's answers, cached),
``prom_reads`` (Prometheus's, cached), ``timerange`` (the window or custom range the pages
show), ``sidebar`` (its settings), ``errors`` (a failed call, explained; a card that may
fail), ``alerts`` (the banners and alerts), ``tables`` (tables and their columns), ``plot``
(a chart on the page) and ``figures`` (how a figure reads). Pages import the module that owns
what they use; plain logic lives in frames/charts/changes/whatif/prom."""
