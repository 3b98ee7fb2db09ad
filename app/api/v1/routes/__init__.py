"""The ``/v1`` route modules."""
