"""The module-level app gunicorn serves: ``gunicorn -c deploy/gunicorn.conf.py collector.wsgi:app``."""

import gc

from collector.app import create_app
from collector.app import prepare_to_serve

app = create_app()
prepare_to_serve(app)

# Everything built so far (modules, the app, compiled statements) lives as long as the
# process: moving it out of the collector's view makes full GC passes, which stall every
# thread of the worker, take microseconds instead of tens of milliseconds.
gc.collect()
gc.freeze()
