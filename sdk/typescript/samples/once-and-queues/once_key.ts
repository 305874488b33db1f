// docs: once-and-queues.md, "Choose the key".
interface Company {
  domain: string;
  name: string;
}
interface HttpClient {
  get(url: string): Promise<string>;
}
async function researchCompany(company: Company, http: HttpClient): Promise<string> {
  return `${company.name}: ${await http.get(`https://${company.domain}/`)}`;
}
let gets = 0;
const http: HttpClient = {
  async get(url) {
    gets += 1;
    return `fetched ${url}`;
  },
};
import runstate from 'runstate-sdk';

// --- sample ---
const research = runstate.once(
  async (company: Company, http: HttpClient) => researchCompany(company, http),
  { name: 'research', key: (company) => company.domain },
);
// --- end of sample ---

const first = await research({ domain: 'acme.com', name: 'Acme' }, http);
const second = await research({ domain: 'acme.com', name: 'Acme Corp' }, { get: async () => 'another client' });
console.log(JSON.stringify({ first, second, gets, key: research.onceKey({ domain: 'acme.com', name: '' }, http) }));
