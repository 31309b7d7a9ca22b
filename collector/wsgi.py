"""The module-level app gunicorn serves: ``gunicorn -c deploy/gunicorn.conf.py collector.wsgi:app``."""

from collector.app import create_app
from collector.app import prepare_to_serve
from collector.serving import frozen

app = create_app()
prepare_to_serve(app)
app = frozen(app)
