"""Who a request is, as the counters name it: the client's address behind trusted proxies
(``addresses``) and the hashed namespace of a subject's counters (``namespaces``). The key
kinds a limit counts by are :mod:`ratelimit_app.identity.keys`, which projects import."""
