"""The global router: per-request routing, its HTTP (OpenAI) API, agent clients, metrics, explanations."""
