"""The outputs: terminal and markdown tables and every number format, the families' tables (through
their registry), the report page, its charts and plots, and the lines that word what a baseline
update wrote. The gate returns numbers; this layer formats them."""
