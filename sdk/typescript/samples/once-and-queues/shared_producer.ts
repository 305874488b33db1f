// Two producers asking for the same company at different times get one job (docs: "Shared tasks").
import { research } from './shared.ts';

const first = await research.send({ company: 'acme', requestedAt: new Date(0).toISOString() });
const second = await research.send({ company: 'acme', requestedAt: new Date().toISOString() });
console.log(JSON.stringify({ sameJob: first.id === second.id, created: [first.created, second.created], key: first.key }));
