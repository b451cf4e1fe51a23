"""The static files storage of production (DEBUG off): hashed names, JS module imports too.

Django's :class:`~django.contrib.staticfiles.storage.ManifestStaticFilesStorage` gives
every file collected into ``STATIC_ROOT`` a name with a hash of its content
(``sse.3f2a….js``) and ``{% static %}`` points at it, so the server may let browsers cache
them for a year (``qwenweb.granian_server.STATIC_MAX_AGE_S``). With
``support_js_module_import_aggregation`` it also rewrites the ``import … from "./x.js"``
lines of the page's ES modules, which would otherwise load the unhashed, stale-able names.
"""

from __future__ import annotations

from django.contrib.staticfiles.storage import ManifestStaticFilesStorage


class HashedStaticFilesStorage(ManifestStaticFilesStorage):
    """``ManifestStaticFilesStorage`` that also hashes the targets of JS module imports."""

    support_js_module_import_aggregation = True
