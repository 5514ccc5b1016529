"""ms-swift's ``--external_plugins`` imports this file: it adds ``rankscope`` to the
callbacks ``--callbacks`` can name (rankscope/integrations/ms_swift.py)."""

from rankscope.integrations.ms_swift import register

register()
