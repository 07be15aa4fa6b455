"""The application: what runs experiments on top of the library."""
