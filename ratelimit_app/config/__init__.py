"""What a project declares, validated and compiled once.

``limits`` (a validated limit and its check of a request), ``rules`` (a rule and the rules
that match a request), ``access`` (allow and deny lists), ``declared`` (the settings' rules
and lists, compiled) and ``sources`` (named limits other parts register: the DRF throttles).
The settings themselves are :mod:`ratelimit_app.conf`; the configuration in force, settings
and database together, is :mod:`ratelimit_app.store`.
"""
