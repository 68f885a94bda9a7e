"""The built-in plugins, one module each, and what only they share (``group``, ``quantity``).

Which of these modules are plugins is :data:`volcano_job_webhook.plugins.registry.BUILTINS`'s to say:
importing this package loads none of them.
"""
