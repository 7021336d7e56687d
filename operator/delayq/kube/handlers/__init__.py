"""kopf handler bodies, one module per concern; operator.py only registers them."""
