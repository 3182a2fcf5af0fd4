"""reshape's upstream engine: one shared pool of origin connections per proxy process."""
