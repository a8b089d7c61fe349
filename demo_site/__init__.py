"""A small Django project that shows django-bucketry at work (``make demo``)."""
