"""The module-level app gunicorn serves: ``gunicorn -c deploy/gunicorn.conf.py collector.wsgi:app``."""

from collector.app import create_app
from collector.app import prepare_database

app = create_app()
prepare_database(app)
