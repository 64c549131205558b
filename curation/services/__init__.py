"""Write services of curation: users and roles, labels, datasets, review."""
